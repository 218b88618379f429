"""Idempotent writes answer 201 when they stored something and 200 when it was already there."""

from ninja import Status


def stored(created, body):
    return Status(201 if created else 200, body)
