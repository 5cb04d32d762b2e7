"""The web page: the board at ``/``, a page per device, sign-in with a token, and the
page's two static files (``pages``). Server-rendered from autoescaped Jinja templates, with
one small script and one stylesheet: no build step, nothing fetched from elsewhere. What
the page changes goes through the REST routes; it stays live through ``/api/v1/events``."""
