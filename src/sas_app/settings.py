"""One typed settings object, read once from the environment.

Every field names its environment variable and default. Reliability defaults live here, in code,
so a user who never reads the README still gets them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from celery.utils.time import rate as celery_rate


def calls_per_second(limit: str) -> float:
    """A rate limit as Celery writes them — ``"20/s"``, ``"100/m"``, ``"5/h"``, or ``"20"`` a
    second — in calls a second; 0 when it is not a positive rate."""
    try:
        return max(float(celery_rate(limit.strip())), 0.0)
    except (ValueError, KeyError, AttributeError):
        return 0.0


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("SAS_HOME", ".sas")).resolve()


@dataclass(frozen=True)
class Settings:
    """Configuration of one sas_app instance.

    Build it with :meth:`from_env` (what the CLI and workers do) or directly in code and tests.
    """

    #: SAS_DATABASE_URL — the state store. Default: an SQLite file under SAS_HOME (embedded, no server).
    #: On PostgreSQL (psycopg2, psycopg) a connect gives up after 10 s and a statement after 30 s
    #: unanswered by the network, unless the URL sets libpq's ``connect_timeout`` or ``tcp_user_timeout``.
    database_url: str = ""
    #: SAS_BROKER_URL — the Celery broker. Default: kombu's filesystem transport under SAS_HOME.
    broker_url: str = ""
    #: SAS_HOME — folder for the embedded defaults (SQLite file, filesystem broker). Default ``.sas``.
    home: Path = field(default_factory=lambda: _home(os.environ))
    #: SAS_SUPERVISOR_INTERVAL — seconds between Supervisor sweeps (beat schedule). Default 5.
    supervisor_interval: float = 5.0
    #: SAS_PICKUP_TIMEOUT — seconds a pending run or step, or a run the Scheduler was asked about
    #: (an operator resumed it), may wait for the Scheduler before the Supervisor re-sends the
    #: Scheduler's message (a lost message). Default 30.
    pickup_timeout: float = 30.0
    #: SAS_RETRY_BACKOFF — first back-off, in seconds, before the Supervisor retries a step that
    #: passed its complete-by; doubled for each further failure. Default 0.5.
    retry_backoff: float = 0.5
    #: SAS_RETRY_BACKOFF_MAX — cap on that back-off. Default 60.
    retry_backoff_max: float = 60.0
    #: SAS_QUEUE_WAIT_MAX — seconds a step's message may wait in its agent's queue, untaken, past
    #: its complete-by without spending an attempt: the Supervisor leaves a step whose message is
    #: still queued (by the queue's depth) alone, and the agent that takes it late (past its
    #: complete-by, or with less than half its time left) gives it its whole timeout from then.
    #: Past this, or with 0, the step counts a failure as a worker's would.
    #: Default 600.
    queue_wait_max: float = 600.0
    #: SAS_SWEEP_BATCH — most expired rows one sweep transaction handles. Default 500.
    sweep_batch: int = 500
    #: SAS_VISIBILITY_TIMEOUT — Redis redelivers an unacknowledged message after this many seconds;
    #: it must exceed the longest step timeout or a slow agent's message is run twice. Default 3600.
    visibility_timeout: float = 3600.0
    #: SAS_BROKER_CONSUMER_TIMEOUT — RabbitMQ closes the channel of a consumer holding a message
    #: unacknowledged for longer than this (its ``consumer_timeout``, 30 minutes by default): with
    #: an AMQP broker every step's timeout plus SAS_CLOCK_SKEW must stay below it. Default 1800.
    broker_consumer_timeout: float = 1800.0
    #: SAS_CLOCK_SKEW — how far, in seconds, hosts' clocks may disagree. Deadlines are compared on
    #: the database's clock, but Celery checks a message's ``expires`` on the consuming worker's
    #: own clock: agent messages expire this long after their step's timeout, as a backstop
    #: only (the agent itself drops a message past complete-by, by the database's clock). Default 120.
    clock_skew: float = 120.0
    #: SAS_MAX_PAYLOAD_BYTES — largest accepted payload (serialised JSON). Default 256 KiB.
    max_payload_bytes: int = 256 * 1024
    #: SAS_MAX_BRANCHES — most branches one ``for_each`` step may fan out to; over it the step
    #: fails with that reason and nothing is dispatched. Default 1000.
    max_branches: int = 1000
    #: SAS_MAX_CHILD_DEPTH — how deep child runs may nest (a child of a child …); a step that
    #: would start one deeper fails with that reason. Default 5.
    max_child_depth: int = 5
    #: SAS_MAX_SLEEP — longest durable sleep, in seconds, a workflow may declare (or a run's
    #: ``until=`` time may be away); longer is refused. Default 30 days.
    max_sleep: float = 30 * 86400.0
    #: SAS_MAX_DEADLINE — longest run deadline, in seconds, a workflow may declare. Default 90 days.
    max_deadline: float = 90 * 86400.0
    #: SAS_RETENTION — delete finished runs this long after they ended (``30d``, ``12h``, seconds),
    #: from beat, in bounded batches. Default off: nothing is ever deleted (``sas purge`` by hand).
    retention: str = ""
    #: SAS_RETENTION_STATES — which finished runs retention deletes. Default processed, compensated, cancelled.
    retention_states: str = "processed,compensated,cancelled"
    #: SAS_ALERT_HOOK — ``module:function`` called with each alert after it is stored (one for an
    #: incident of many steps, with their ``count`` and ``runs``: see sas_app.engine.alerts). Default
    #: none.
    alert_hook: str = ""
    #: SAS_ALERT_WEBHOOK — URL that receives each alert (as the hook does) as a JSON POST (retried).
    #: Default none.
    alert_webhook: str = ""
    #: SAS_ALERT_WEBHOOK_TIMEOUT — seconds to wait for the webhook on each try. Default 2.
    alert_webhook_timeout: float = 2.0
    #: SAS_AT_RISK_FORECAST — the at-risk forecast (sas_app.supervision.forecast): from the agents'
    #: queues and their recent pace, alert on the running steps whose messages will likely be taken
    #: past their complete-by, and pace the retries of a deep queue (SAS_PACE_RETRIES). Off: no
    #: at-risk alert, and every expired step is retried after its back-off alone. Default on.
    at_risk_forecast: bool = True
    #: SAS_AT_RISK_WINDOW — seconds of recent completions used to judge whether an agent's queue
    #: will drain before a step's complete-by (the at-risk alert). Default 60.
    at_risk_window: float = 60.0
    #: SAS_AT_RISK_INTERVAL — seconds between the Supervisor's looks at the busy agents' queues for
    #: steps that will likely miss their complete-by (a thread of each worker consuming its queue:
    #: sas_app.supervision.forecast.lookout; cheap while no message waits). A step at the margin is
    #: judged in its last look: keep it under a thirtieth of the shortest step timeout. Default 0.5.
    at_risk_interval: float = 0.5
    #: SAS_PACE_RETRIES — when an agent's queue is too deep to take a new message within a step's
    #: timeout, the Supervisor holds the retries of that agent's expired steps until it has drained
    #: to half a timeout's worth, then lets them go at the pace the agent completes steps, instead of
    #: adding them to the backlog to expire again (a retry storm). Default on.
    pace_retries: bool = True
    #: SAS_BREAKER_FAIL_MAX — transient failures in a row that open an agent's circuit breaker;
    #: 0 disables breakers. Default 5.
    breaker_fail_max: int = 5
    #: SAS_BREAKER_RESET — seconds a breaker stays open before one probe call. Default 10.
    breaker_reset: float = 10.0
    #: SAS_BREAKER_URL — Redis holding the circuit breakers and rate limits shared by all workers.
    #: Default: the broker's URL when it is Redis; otherwise the state store (tables ``breakers``
    #: and ``rate_limits``).
    breaker_url: str = ""
    #: SAS_AGENT_RATE_LIMITS — rate limits per agent, ``"payment=20/s,warehouse=5/s"``: every
    #: worker together calls the agent's service at most that often. Default none.
    agent_rate_limits: str = ""
    #: SAS_INLINE_REPLIES — an agent worker runs the Scheduler's reply handler itself instead of
    #: sending the reply through the Scheduler's queue: one message per step instead of two.
    #: Agents then need the state store's URL. Default on.
    inline_replies: bool = True
    #: SAS_EAGER_STEPS — with inline replies, the steps an agent worker runs in a row itself when
    #: each one's next step is the same agent's (no message for them); 0 sends every step through
    #: the broker. Default 8.
    eager_steps: int = 8
    #: SAS_PREPARED_STATEMENTS — on PostgreSQL, the hot path's statements are prepared once per
    #: connection, so PostgreSQL plans them once instead of on every step. Turn it off behind a
    #: connection pooler in transaction mode (PgBouncer), which does not keep a session's prepared
    #: statements from one transaction to the next. Default on.
    prepared_statements: bool = True
    #: SAS_FAULTS — fault points to arm, for tests and chaos runs only (see sas_app.fault_points).
    #: Default none.
    faults: str = ""
    #: SAS_TRACING — OpenTelemetry traces: ``otlp`` (to OTEL_EXPORTER_OTLP_ENDPOINT) or ``console``.
    #: Default off.
    tracing: str = ""
    #: SAS_DEBUG_LOGS — loggers a worker logs at DEBUG, comma-separated (each module logs under its
    #: own name): ``sas_app.supervision.forecast.watch`` logs each at-risk look (each queue's
    #: depth, its pace, the steps found at risk). Default none.
    debug_logs: str = ""
    #: SAS_TASK_EVENTS — workers send Celery task events, so Flower can show every task. Default on.
    task_events: bool = True
    #: SAS_AGENT_CONCURRENCY — default worker concurrency for ``sas worker``. Default 4.
    agent_concurrency: int = 4
    #: SAS_BROKER_CA_FILE — with a broker over TLS (``rediss://``, ``amqps://``): the certificate
    #: authority (a PEM file) its certificate is verified against. Default: the system's.
    broker_ca_file: str = ""
    #: SAS_BROKER_CERT_FILE — with a broker over TLS that asks for clients' certificates: this
    #: client's (a PEM file). Default none.
    broker_cert_file: str = ""
    #: SAS_BROKER_KEY_FILE — the private key of SAS_BROKER_CERT_FILE (a PEM file). Default none.
    broker_key_file: str = ""
    #: SAS_BROKER_TRUST — how the Scheduler takes ``sas.submit`` and ``sas.signal`` from the broker:
    #: ``open`` (from anyone who can write to the broker), ``signed`` (only with a valid HMAC of a
    #: key in SAS_BROKER_KEYS: see sas_app.messaging.signing) or ``closed`` (not at all). Default open.
    broker_trust: str = "open"
    #: SAS_BROKER_KEYS — ``<id>:<secret>[,<id>:<secret>...]``, secrets of at least 32 characters:
    #: each verifies a signed message; the first signs. Default none.
    broker_keys: str = ""
    #: SAS_BROKER_SIGNATURE_MAX_AGE — seconds a signature stays good after it was made (and how far
    #: ahead a sender's clock may be): longer than a message may wait for a Scheduler worker, and
    #: shorter than SAS_RETENTION (a replay after its run was deleted would start it again).
    #: Default 86400 (a day).
    broker_signature_max_age: float = 86400.0
    #: SAS_READY_FILE — a file a worker (or beat) writes once it consumes, so that whatever started
    #: it (a process supervisor, the tests' and the demo's process harness) knows it is ready
    #: without reading its log. Default none.
    ready_file: str = ""

    def __post_init__(self) -> None:
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{self.embedded_store_file}")
        if not self.broker_url:
            object.__setattr__(self, "broker_url", "filesystem://")
        for name in ("supervisor_interval", "at_risk_interval", "pickup_timeout", "retry_backoff",
                     "visibility_timeout", "clock_skew", "broker_consumer_timeout", "broker_signature_max_age"):
            if getattr(self, name) <= 0:
                raise ValueError(f"setting {name} must be positive, got {getattr(self, name)!r}")
        tls_files = [f"SAS_{name.upper()}" for name in ("broker_ca_file", "broker_cert_file", "broker_key_file")
                     if getattr(self, name)]
        if tls_files and not self.broker_url.startswith(("rediss://", "amqps://")):
            raise ValueError(f"{', '.join(tls_files)} apply to a broker over TLS (rediss://, amqps://); "
                             "SAS_BROKER_URL does not use it")
        if self.broker_trust not in ("open", "signed", "closed"):
            raise ValueError(f"SAS_BROKER_TRUST must be open, signed or closed, got {self.broker_trust!r}")
        if self.broker_trust == "signed" and not self.broker_keys.strip():
            raise ValueError("SAS_BROKER_TRUST=signed needs SAS_BROKER_KEYS (<id>:<secret>, the secret at least "
                             "32 characters)")
        if self.queue_wait_max < 0:
            raise ValueError(f"setting queue_wait_max must be 0 (off) or more seconds, got {self.queue_wait_max!r}")
        if self.eager_steps < 0:
            raise ValueError(f"setting eager_steps must be 0 (off) or more steps, got {self.eager_steps!r}")
        self.rate_limits()
        for name in ("sweep_batch", "max_branches", "max_child_depth"):
            if getattr(self, name) <= 0:
                raise ValueError(f"setting {name} must be positive, got {getattr(self, name)!r}")

    def rate_limits(self) -> dict[str, str]:
        """SAS_AGENT_RATE_LIMITS by agent (the first item naming an agent wins); ValueError naming
        an item that is not ``agent=limit`` with a positive limit."""
        limits: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in self.agent_rate_limits.split(","))):
            name, sep, limit = item.partition("=")
            if not sep or not name.strip() or not limit.strip():
                raise ValueError(f"SAS_AGENT_RATE_LIMITS: {item!r} is not agent=limit (e.g. payment=20/s)")
            if calls_per_second(limit) <= 0:
                raise ValueError(f"SAS_AGENT_RATE_LIMITS: {item!r} is not agent=limit with a positive limit "
                                 "(e.g. payment=20/s, warehouse=100/m)")
            limits.setdefault(name.strip(), limit.strip())
        return limits

    def rate_limit(self, agent: str) -> str | None:
        """The rate limit SAS_AGENT_RATE_LIMITS sets for ``agent``, if any."""
        return self.rate_limits().get(agent)

    @property
    def amqp_broker(self) -> bool:
        """The broker is RabbitMQ (or another AMQP 0-9-1 broker)."""
        return is_amqp(self.broker_url)

    @property
    def redis_broker(self) -> bool:
        """The broker is Redis (``redis://``, or ``rediss://`` over TLS)."""
        return self.broker_url.startswith(("redis://", "rediss://"))

    def redis_tls(self, url: str) -> dict[str, Any]:
        """What redis-py needs to reach ``url`` over TLS (``rediss://``), verifying the server's
        certificate against SAS_BROKER_CA_FILE (else the system's authorities); nothing otherwise."""
        if not url.startswith("rediss://"):
            return {}
        options: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True,
                                   "ssl_ca_certs": self.broker_ca_file or None,
                                   "ssl_certfile": self.broker_cert_file or None,
                                   "ssl_keyfile": self.broker_key_file or None}
        return {k: v for k, v in options.items() if v is not None}

    @property
    def breaker_redis_url(self) -> str:
        """The Redis holding the agents' circuit breakers: SAS_BREAKER_URL, else the broker's when it
        is Redis; empty when the state store holds them."""
        return self.breaker_url or (self.broker_url if self.redis_broker else "")

    @property
    def embedded_store_file(self) -> Path:
        """The default state store's SQLite file, under SAS_HOME."""
        return Path(self.home) / "state.db"

    @property
    def embedded_store(self) -> bool:
        """The state store is the default SQLite file under SAS_HOME (no server): its schema is
        created, or brought up to date, on first use."""
        return self.database_url == f"sqlite:///{self.embedded_store_file}"

    @property
    def embedded_broker(self) -> bool:
        return self.broker_url.startswith("filesystem://")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Read every ``SAS_<FIELD>`` variable; ``overrides`` win over the environment."""
        env = os.environ if env is None else env
        values: dict[str, object] = {"home": _home(env)}
        for f in fields(cls):
            raw = env.get(f"SAS_{f.name.upper()}")
            if raw is None or f.name == "home":
                continue
            kind = type(getattr(cls, f.name, ""))
            try:
                values[f.name] = _parse(kind, raw)
            except ValueError:
                raise ValueError(f"SAS_{f.name.upper()}={raw!r} is not a valid {kind.__name__}") from None
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def _parse(kind: type, raw: str) -> object:
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(raw)
    if kind in (int, float):
        return kind(raw)
    return raw


def is_amqp(url: str) -> bool:
    """A broker URL of RabbitMQ (or another AMQP 0-9-1 broker)."""
    return url.startswith(("amqp://", "amqps://", "pyamqp://"))


def redact_url(url: str) -> str:
    """A URL fit for a log line: scheme, host and port only. Credentials may sit in the user info
    (``redis://:password@host``) or in the path and query (a chat webhook's token)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:  # not a number: the URL is wrong, and the error that follows says so
        port = None
    if port:
        host = f"{host}:{port}"
    return f"{parts.scheme}://{host}/…" if parts.scheme else "(url)"


#: settings whose values may carry credentials
SECRET_SETTINGS = ("SAS_DATABASE_URL", "SAS_BROKER_URL", "SAS_BREAKER_URL", "SAS_ALERT_WEBHOOK")


def mask_secrets(text: str, env: Mapping[str, str] | None = None) -> str:
    """``text`` with every password (and webhook path) found in the ``SAS_*`` URLs replaced by
    ``***``: for messages built from errors whose wording we do not control."""
    env = os.environ if env is None else env
    for name in SECRET_SETTINGS:
        value = env.get(name, "")
        if not value:
            continue
        parts = urlsplit(value)
        try:
            password = parts.password
        except ValueError:
            password = None
        hidden = [password] if password else []
        if name == "SAS_ALERT_WEBHOOK" and (parts.path.strip("/") or parts.query):
            hidden += [value, parts.path + (f"?{parts.query}" if parts.query else "")]
        for secret in sorted(filter(None, hidden), key=len, reverse=True):
            text = text.replace(secret, "***")
    return text


_instance: tuple[int, str] = (0, "")


def instance_id() -> str:
    """This process's identity, written to ``locked_by``: ``host:pid`` (each forked worker child
    has its own: it is worked out again in a process whose pid is not the one it was made in)."""
    global _instance
    pid = os.getpid()
    if _instance[0] != pid:
        _instance = (pid, f"{socket.gethostname()}:{pid}")
    return _instance[1]
