"""Session fixtures: the real Neo4j and Redis started by ``make test``, plus a real API process.

Nothing here mocks a database. A missing service is a failure with a clear message, never a skip.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import httpx
import neo4j
import pytest

from graph.learning import ENDS
from services.bootstrap import open_runtime
from services.runtime import Runtime
from services.settings import Settings, load_settings
from tests.client import Api
from tests.model_server import ModelServer
from tests.waiting import until
from tools.processes import ServerProcess
from tools.processes import WorkerProcess as _WorkerProcess

#: The model the test organizations use, and its price (20 micro-USD for the default 10+5 tokens).
TEST_MODEL = "test-model"

#: Deadlines shortened for the suite (D9.11); one test runs the real 15 s with its own API.
SHORT_DEADLINES = {
    # Entries the tests write without an embedder stay without vectors unless a test backfills.
    "BOTMEMORY_BACKFILL": "false",
    "BOTMEMORY_ANSWER_DEADLINE_SECONDS": "3",
    "BOTMEMORY_STEP_DEADLINE_SECONDS": "4",
    "BOTMEMORY_MODEL_ATTEMPT_TIMEOUT_SECONDS": "1.5",
    "BOTMEMORY_MODEL_MAX_ATTEMPTS": "3",
    "BOTMEMORY_LEASE_SECONDS": "2",
    "BOTMEMORY_SWEEP_INTERVAL_SECONDS": "0.2",
    "BOTMEMORY_REQUEUE_AFTER_SECONDS": "3",
    "BOTMEMORY_TURN_IDLE_TIMEOUT_SECONDS": "4",
    "BOTMEMORY_CHANGE_AUDIT_SECONDS": "1",
    "BOTMEMORY_MODEL_PRICES": '{"test-model": {"input": 1000000, "output": 2000000}}',
}

#: Deadlines no busy machine reaches, for a process whose model answer a test holds
#: (``Reply.hold``) until the operation it races has committed: that answer is asked once and
#: waited for however long the operation takes (the suite's 1.5 s attempt would be asked again).
PATIENT_DEADLINES = {
    "BOTMEMORY_ANSWER_DEADLINE_SECONDS": "60",
    "BOTMEMORY_STEP_DEADLINE_SECONDS": "60",
    "BOTMEMORY_MODEL_ATTEMPT_TIMEOUT_SECONDS": "60",
}

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def settings() -> Settings:
    s = load_settings()
    if s.env != "test":
        pytest.exit("run the tests with `make test` (BOTMEMORY_ENV=test and the test ports)", returncode=2)
    return s


@pytest.fixture(scope="session")
async def runtime(settings: Settings) -> AsyncIterator[Runtime]:
    try:
        async with open_runtime(settings) as rt:
            await rt.driver.verify_connectivity()
            await rt.redis.ping()  # type: ignore[misc]
            yield rt
    except OSError as exc:  # pragma: no cover - reported, never skipped
        pytest.fail(f"Neo4j/Redis of the test stack are not reachable ({exc}); run `make test`")


@pytest.fixture(scope="session")
def model_server() -> Iterator[ModelServer]:
    """The scripted OpenAI-compatible model provider (the only test double, a real HTTP server)."""
    server = ModelServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def service_env(model_server: ModelServer) -> dict[str, str]:
    """Environment of the API and worker processes the tests start."""
    return {"OPENAI_BASE_URL": model_server.base_url, "OPENAI_API_KEY": "sk-test", **SHORT_DEADLINES}


class ApiProcess(ServerProcess):
    """A real API process (``python -m botmemory.serve``) with the test settings, and its log."""

    def __init__(self, settings: Settings, log_path: Path, extra_env: dict[str, str] | None = None) -> None:
        super().__init__(log_path, extra_env, cwd=ROOT)


@pytest.fixture(scope="session")
def api_process(settings: Settings, service_env: dict[str, str]) -> Iterator[ApiProcess]:
    process = ApiProcess(settings, settings.data_dir / "logs" / "pytest-api.log", service_env)
    yield process
    process.stop()


class WorkerProcess(_WorkerProcess):
    """A real arq worker process with the test settings, and its log file."""

    def __init__(self, log_path: Path, extra_env: dict[str, str] | None = None) -> None:
        super().__init__(log_path, extra_env, cwd=ROOT)


#: The suite's worker, for the story of a failed test (``pytest_runtest_makereport``).
_WORKERS: list[WorkerProcess] = []


@pytest.fixture(scope="session")
def worker_process(settings: Settings, service_env: dict[str, str]) -> Iterator[WorkerProcess]:
    process = WorkerProcess(settings.data_dir / "logs" / "pytest-worker.log", service_env)
    _WORKERS.append(process)
    yield process
    _WORKERS.remove(process)
    process.stop()


#: The worker log's last lines a failed test's report shows (the cron jobs' lines left out).
_STORY_LINES = 60


def _worker_story(process: WorkerProcess) -> str:
    """The worker's last log lines, after it logged where each of its tasks waits (SIGUSR1,
    ``services.logs.log_tasks``): what a learning execution that never ended was waiting on."""
    if process.proc.poll() is None:
        size = process.log_path.stat().st_size
        process.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with process.log_path.open("rb") as f:
                f.seek(size)
                if b"tasks: end" in f.read():
                    break
            time.sleep(0.05)
    lines = process.log_path.read_text(errors="replace").splitlines()
    kept = [line for line in lines[-4 * _STORY_LINES :] if "cron:" not in line]
    return "\n".join(kept[-_STORY_LINES:])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that failed while the suite's worker runs shows the worker's story with it."""
    report = yield
    if report.failed and report.when in ("setup", "call") and _WORKERS:
        report.sections.append(("worker log (last lines, tasks at the failure)", _worker_story(_WORKERS[0])))
        report.sections.append(("Neo4j transactions at the failure", _transactions()))
    return report


def _transactions() -> str:
    """Neo4j's transactions as the test failed: which wait for a lock, held by whom, doing what
    (the statement's text, never its parameters)."""
    settings = load_settings()
    password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else ""
    try:
        with neo4j.GraphDatabase.driver(settings.neo4j_uri, auth=(settings.neo4j_user, password)) as driver:
            records, _, _ = driver.execute_query(
                "SHOW TRANSACTIONS YIELD transactionId, status, elapsedTime, currentQuery "
                "RETURN transactionId, status, elapsedTime, currentQuery ORDER BY elapsedTime DESC"
            )
    except neo4j.exceptions.Neo4jError as exc:
        return f"not read: {exc.code}"
    except (neo4j.exceptions.DriverError, OSError) as exc:
        return f"not read: {type(exc).__name__}"
    return "\n".join(
        f"{r['transactionId']} {r['status']} {r['elapsedTime']} {' '.join(str(r['currentQuery']).split())[:160]}"
        for r in records
    )


@pytest.fixture(scope="session")
async def api(api_process: ApiProcess, settings: Settings) -> AsyncIterator[Api]:
    assert settings.admin_token is not None
    async with httpx.AsyncClient(base_url=api_process.url, timeout=30) as http:
        yield Api(http, settings.admin_token.get_secret_value())


@pytest.fixture(scope="session")
def patient_api_process(settings: Settings, service_env: dict[str, str]) -> Iterator[ApiProcess]:
    process = ApiProcess(
        settings, settings.data_dir / "logs" / "pytest-api-patient.log", {**service_env, **PATIENT_DEADLINES}
    )
    yield process
    process.stop()


@pytest.fixture(scope="session")
async def patient_api(patient_api_process: ApiProcess, settings: Settings) -> AsyncIterator[Api]:
    """A second API process with :data:`PATIENT_DEADLINES`: its answers wait for a held model."""
    assert settings.admin_token is not None
    async with httpx.AsyncClient(base_url=patient_api_process.url, timeout=90) as http:
        yield Api(http, settings.admin_token.get_secret_value())


#: Learning that earlier tests left to run (not ended: a confided Turn never completed, which the
#: sweeper queues once idle; a queued or budget-waiting execution; one whose worker was killed, its
#: lease run out) ends before the next test scripts its model: it would otherwise take that test's
#: scripted answers. Then how many still run (a worker's live lease): the fixture waits for those
#: before a test, and leaves them to end by themselves after it.
_SETTLE_LEARNING = """
MATCH (x:LearningExecution)
WHERE NOT x.status IN $ends AND (x.status <> 'running' OR x.leaseUntil < timestamp())
SET x.status = 'failed', x.error = 'test:settled', x.endedAt = timestamp()
WITH count(x) AS settled
OPTIONAL MATCH (x:LearningExecution {status: 'running'})
RETURN count(x) AS running
"""


@pytest.fixture
async def learning_worker(
    worker_process: WorkerProcess, model_server: ModelServer, runtime: Runtime
) -> AsyncIterator[WorkerProcess]:
    """A live worker and a model server with nothing scripted and no earlier test's learning left
    to ask it; a test that killed the worker leaves a live one behind for the next."""
    if worker_process.proc.poll() is not None:
        worker_process.restart()
    worker_process.wait_ready()

    async def settled() -> bool:
        records, _, _ = await runtime.driver.execute_query(_SETTLE_LEARNING, ends=list(ENDS))
        return records[0]["running"] == 0

    await until(settled, "an earlier test's learning execution is still running", within=30)
    model_server.reset()
    yield worker_process
    # And what this test leaves, before later tests (some script answers for any task) run.
    await runtime.driver.execute_query(_SETTLE_LEARNING, ends=list(ENDS))
    if worker_process.proc.poll() is not None:
        worker_process.restart()
        worker_process.wait_ready()


@pytest.fixture
def patient_worker(
    learning_worker: WorkerProcess, settings: Settings, service_env: dict[str, str]
) -> Iterator[WorkerProcess]:
    """The one live worker, with :data:`PATIENT_DEADLINES`: a learn answer the test holds is asked
    once and waited for. The suite's worker is killed meanwhile; ``learning_worker`` brings it back."""
    learning_worker.kill()
    worker = WorkerProcess(
        settings.data_dir / "logs" / "pytest-worker-patient.log", {**service_env, **PATIENT_DEADLINES}
    )
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()
