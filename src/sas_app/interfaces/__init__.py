"""What users and operators call: submit and look at runs (``client``, ``bulk``), submit with only
the broker (``producer``), send signals (``signals``), scheduled starts (``schedules``), operate on
runs (``operations``), retention (``retention``), progress notifications (``notifications``) and the
health checks of ``sas doctor`` (``doctor``). :class:`sas_app.SasApp` gathers them.
"""
