from django.apps import AppConfig


class KernelsConfig(AppConfig):
    name = "moeops.kernels"

    def ready(self):
        from moeops import jobs
        from moeops.kernels import services

        jobs.stale_reaper_add("tunes", services.tuning_run_fail_stale)
