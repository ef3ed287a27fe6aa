"""Renderers: they turn a report or a playbook into text; they never compute one."""
