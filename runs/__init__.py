"""The run domain: models, transitions, services, the API and the dashboard.

``from runs import submit_run`` is the in-process submit path (see
``runs.services.submit_run``); it is imported lazily so that importing this
package before the app registry is ready stays harmless.
"""


def submit_run(**kwargs):
    from runs.services import submit_run as _submit_run

    return _submit_run(**kwargs)


submit_run.__doc__ = "Submit a run; see runs.services.submit_run."
