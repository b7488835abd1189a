"""A framework task outside the app's ``tasks`` module (Django's docs: a convention, not a rule).
Nothing imports this module at start-up: workers import it when they first meet one of its runs."""

try:
    from django.tasks import task as framework_task
except ImportError:
    from django_tasks import task as framework_task

NOT_A_TASK = "a string"


@framework_task
def ft_elsewhere(x: int) -> int:
    return x + 1


def plain(x: int) -> int:
    return x
