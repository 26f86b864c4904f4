"""Engines: one protocol, several backends (torch, ort, cuda, trt, auto)."""
