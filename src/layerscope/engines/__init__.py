"""Engines: one protocol (base.py), several backends that declare themselves in registry.py."""
