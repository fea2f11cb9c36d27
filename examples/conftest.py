"""The examples' tests run each example's own app on sas_app's test kit (the ``sas_env`` fixture).

An example's app is made when its module is imported, from SAS_* variables; its actions keep
their files under SAS_HOME. Both go to a folder of this test session's, not to ``.sas``."""

import os
import tempfile

os.environ.setdefault("SAS_HOME", tempfile.mkdtemp(prefix="sas-examples-"))
