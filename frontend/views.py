"""Console pages. Thin: they read through selectors and write through services."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def home(request):
    return render(request, "frontend/home.html", {})
