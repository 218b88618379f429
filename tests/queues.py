"""What the web tier sent to a host's queue, read back from the real Redis.

`send_to(monkeypatch, broker_url)` points the web tier's `send_host_task` at that broker (a
closed port makes the broker unreachable for real); `queued(redis_url, queue)` lists the tasks
waiting there, oldest first, as Celery's Redis transport stores them.
"""

import base64
import json
from dataclasses import dataclass

import redis
from celery import Celery

from moeops import celery as web_celery


@dataclass
class Queued:
    task: str
    kwargs: dict
    headers: dict
    # callbacks, errbacks and the rest of a chain, as Celery's protocol 2 embeds them
    embed: dict


def send_to(monkeypatch, broker_url):
    # the web app's broker is fixed when Django's settings load; tests pick theirs later
    app = Celery("moeops-test-producer", broker=broker_url)
    app.conf.update(task_serializer="json", accept_content=["json"])
    monkeypatch.setattr(web_celery, "app", app)
    return app


def queued(redis_url, queue):
    """The tasks waiting in `queue`, oldest first (the transport pushes on the left)."""
    messages = redis.Redis.from_url(redis_url).lrange(queue, 0, -1)
    out = []
    for raw in reversed(messages):
        message = json.loads(raw)
        _, kwargs, embed = json.loads(base64.b64decode(message["body"]))
        out.append(Queued(message["headers"]["task"], kwargs, message["headers"], embed or {}))
    return out


def clear(redis_url, *queues):
    redis.Redis.from_url(redis_url).delete(*queues)
