from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kernels", "0011_tuningrun_routing"),
    ]

    operations = [
        migrations.AddField(
            model_name="tuningtiming",
            name="also_under",
            field=models.JSONField(
                blank=True,
                help_text="the written, default and shipped configs timed again under another "
                "routing than the tune's: {routing, tuned_us, default_us, shipped_us}",
                null=True,
            ),
        ),
    ]
