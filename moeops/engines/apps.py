from django.apps import AppConfig


class EnginesConfig(AppConfig):
    name = "moeops.engines"
