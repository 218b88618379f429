import pytest

from moeops.kernels import services as kernel_services
from moeops.runs import services as run_services
from tests import page_base


@pytest.fixture
def sent(monkeypatch):
    """What the web tier sends to hosts' queues (sweeps and tunes), kept here instead of sent:
    one (task name, host, kwargs) a task."""
    calls = []

    def send_host_task(name, host, kwargs):
        calls.append((name, host, kwargs))

    monkeypatch.setattr(run_services, "send_host_task", send_host_task)
    monkeypatch.setattr(kernel_services, "send_host_task", send_host_task)
    return calls


@pytest.fixture
def staff(client):
    """A staff member, ops, signed in on `client`."""
    return page_base.sign_in(client, "ops", staff=True)
