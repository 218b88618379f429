from django.apps import AppConfig


class WatchesConfig(AppConfig):
    name = "moeops.watches"
    verbose_name = "Regression watches"

    def ready(self):
        from moeops import jobs
        from moeops.engines.models import EngineAction
        from moeops.runs.models import SweepRun

        # tasks: they bind to the web side's Celery app as Django starts, not to whichever app
        # moeops.celery.app names when the first alert imports them (a test's producer app)
        from moeops.watches import bisection, services, tasks  # noqa: F401

        jobs.finished_handler_add(SweepRun, services.on_run_finished, step=jobs.Step.JUDGE)
        jobs.finished_handler_add(SweepRun, bisection.on_run_finished, step=jobs.Step.BISECT)
        jobs.finished_handler_add(EngineAction, bisection.on_action_finished, step=jobs.Step.BISECT)
