"""The JSON API of the run domain (django-ninja): one Router, mounted on the NinjaAPI in ``config/api.py``.

- ``endpoints``: the router, its API-key auth, submit, the run list, a run, its steps, kinds, health;
- ``control``: people acting on runs (cancel, pause, resume, approve, reject, resolve, message, retry);
- ``artifacts``: a run's artifacts;
- ``schemas``: the explicit input and output schemas.
"""
