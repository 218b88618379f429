import pytest

from workers.engine_supervisor import EngineSupervisor


@pytest.fixture
def supervisor(tmp_path):
    """An engine supervisor keeping its state under tmp_path; stops what is left running."""
    supervisor = EngineSupervisor(tmp_path / "engines")
    yield supervisor
    for state in supervisor.running():
        supervisor.stop(state["recipe"]["deployment"], grace_s=5)
