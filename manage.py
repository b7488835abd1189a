#!/usr/bin/env python
"""Django's command-line utility for the distsched project.

A malformed environment variable stops every command with one line; ``runserver``
also refuses to start without a secret key (``scheduler_project/startup.py``).
"""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    from django.core.management import execute_from_command_line

    from scheduler_project import startup

    if sys.argv[1:2] == ["runserver"]:
        startup.require_secret_key()
    else:
        startup.load_settings()
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
