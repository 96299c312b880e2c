from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboards', '0016_final_standings'),
    ]

    operations = [
        migrations.AddField(
            model_name='profile',
            name='publish_submissions',
            field=models.BooleanField(default=True, help_text='Include my submissions in the published submissions dataset.'),
        ),
    ]
