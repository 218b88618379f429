from django.apps import AppConfig


class KernelsConfig(AppConfig):
    name = "moeops.kernels"
