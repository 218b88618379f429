from django.apps import AppConfig


class InsightsConfig(AppConfig):
    name = "moeops.insights"

    def ready(self):
        from moeops import jobs
        from moeops.insights import services
        from moeops.runs.models import SweepRun

        jobs.finished_handler_add(SweepRun, services.on_run_finished, step=jobs.Step.ANALYZE)
