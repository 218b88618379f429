import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create (or reset) the local admin login and print it; the password is kept in var/."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username, **options):
        password_file = settings.VAR_DIR / "admin-password.txt"
        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        if password_file.exists():
            password = password_file.read_text().strip()
        else:
            password = secrets.token_urlsafe(12)
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"login: {username} / {password}")
