"""The htmx dashboard: small function views over the run domain's services and selectors.

- ``views``: the run list, the submit form, the run page, the tenant switcher;
- ``actions``: the POSTs of the run page (cancel, pause, resume, retry, approve, reject, resolve, message);
- ``access``: who may do what (the selected tenant, the membership's role, the console permissions);
- ``forms``, ``presenters``, ``selectors``: parsing, wording and the reads only the dashboard needs;
- ``urls``: its routes (mounted at ``/`` by ``config/urls.py``).
"""
