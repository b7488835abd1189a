"""Helpers of the ``distsched`` operator command: argument types, JSON shapes, tables."""
