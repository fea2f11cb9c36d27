"""What the benchmarks and the integration tests stand up around the stack: PostgreSQL's pooler
(``pgbouncer``), servers of their own to crash and restart (``servers``, ``rabbitmq_node``), and a
TCP proxy to partition a process from one (``proxy``). Not part of sas_app: it is not installed with
it; users' tests have :mod:`sas_app.testing`."""
