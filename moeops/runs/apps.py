from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "moeops.runs"

    def ready(self):
        from moeops import jobs
        from moeops.runs import services
        from moeops.runs.models import SweepRun

        jobs.finished_handler_add(SweepRun, services.on_run_finished, step=jobs.Step.RECORD)
        # in this order: a sweep whose host's worker came back is sent to it again before the
        # lost ones are failed, or it would be failed with them
        jobs.stale_reaper_add("runs resent", services.run_resend_orphaned)
        jobs.stale_reaper_add("runs", services.run_fail_stale)
