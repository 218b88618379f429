from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kernels", "0009_body_sha256_of_keyed_creates"),
    ]

    operations = [
        migrations.AddField(
            model_name="kernelconfig",
            name="compile_checked",
            field=models.JSONField(
                blank=True,
                help_text="compiled, not timed, for its GPU (python -m tuning compile-check "
                "--entries): capability, limit_bytes, max_shared_bytes, fewer_stages, kernel, "
                "triton_version",
                null=True,
            ),
        ),
    ]
