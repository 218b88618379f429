from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kernels", "0010_kernelconfig_compile_checked"),
    ]

    operations = [
        migrations.AddField(
            model_name="tuningrun",
            name="routing",
            field=models.CharField(
                default="uniform",
                help_text="what the timings drew their router choices under: uniform, zipf:S, "
                "dirichlet:A (tuning.routing)",
                max_length=40,
            ),
        ),
    ]
