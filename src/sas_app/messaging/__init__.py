"""The Celery integration: where every message goes and how it is sent after a commit
(``routing``), the messages by name with the row behind each (``publishes``), the Celery settings
reliability rests on (``celery_config``), kombu's transports as sas_app uses them
(``redis_transport``, ``filesystem_transport``), reconnecting to a broker that comes back
(``reconnect``), and the account of faults an agent's reply carries (``fault_log``).

Below the store: nothing here reads or writes a row.
"""
