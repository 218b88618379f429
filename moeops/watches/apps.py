from django.apps import AppConfig


class WatchesConfig(AppConfig):
    name = "moeops.watches"
    verbose_name = "Regression watches"

    def ready(self):
        # the tasks bind to the web side's Celery app as Django starts, not to whichever app
        # moeops.celery.app names when the first alert imports them (a test's producer app)
        from moeops.watches import tasks  # noqa: F401
