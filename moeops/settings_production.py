"""Production settings: `DJANGO_SETTINGS_MODULE=moeops.settings_production`.

Passes `manage.py check --deploy`; needs SECRET_KEY and ALLOWED_HOSTS from the environment.
"""

import os

from django.core.exceptions import ImproperlyConfigured

from moeops.settings import *  # noqa: F403
from moeops.settings import envbool, envint

if not os.getenv("SECRET_KEY"):
    raise ImproperlyConfigured("SECRET_KEY must be set in production")
if not os.getenv("ALLOWED_HOSTS"):
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set in production")

DEBUG = False
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
