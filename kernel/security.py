"""Response headers Django's SecurityMiddleware does not set: the Content-Security-Policy.

The console has no inline script, event-handler or style attribute (tests/frontend/test_csp_ready.py), so the
policy allows scripts and styles from our own origin only. ``GPUPOOL_CSP`` replaces the policy; an empty value
turns the header off. A view that sets its own policy keeps it.
"""

from __future__ import annotations

from django.conf import settings

DEFAULT_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        policy = settings.GPUPOOL_CSP
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response
