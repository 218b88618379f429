from django.apps import AppConfig


class InsightsConfig(AppConfig):
    name = "moeops.insights"
