from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "moeops.fleet"
