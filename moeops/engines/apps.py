from django.apps import AppConfig


class EnginesConfig(AppConfig):
    name = "moeops.engines"

    def ready(self):
        from moeops import jobs
        from moeops.engines import services
        from moeops.kernels.models import TuningRun
        from moeops.runs.models import SweepRun

        jobs.finished_handler_add(SweepRun, services.on_run_finished, step=jobs.Step.FOLLOW_UP)
        jobs.finished_handler_add(TuningRun, services.on_tune_finished, step=jobs.Step.FOLLOW_UP)
        jobs.stale_reaper_add("actions", services.engine_action_fail_stale)
