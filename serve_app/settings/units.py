"""Byte units the settings' defaults are written in."""

KiB = 1024
MiB = 1024 * KiB
