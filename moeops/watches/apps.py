from django.apps import AppConfig


class WatchesConfig(AppConfig):
    name = "moeops.watches"
    verbose_name = "Regression watches"
