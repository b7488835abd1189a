"""The service layer: every state change of schedules, runs and workers.

Each public function is one transaction, takes ``now`` (read once by the
caller from its clock) and raises typed errors from ``distsched_app.errors``.
Adapters (admin, API, commands, metrics) call these and nothing below them.
"""
