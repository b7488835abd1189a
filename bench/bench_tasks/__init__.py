"""The client side of ``bench/tasks_framework.py``: one app, one task, one enqueue loop.

Installed (with ``bench/`` on ``PYTHONPATH``) by ``bench_tasks.settings``; both
systems run exactly this code, only ``TASKS["default"]["BACKEND"]`` differs.
"""
