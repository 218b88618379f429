"""The top bar's links (moeops_nav): every section, the page's own marked, Admin for staff, under
the script prefix the site is served at."""

import re

import pytest
from django.urls import set_script_prefix

from moeops.front.templatetags.moeops_nav import nav_links
from tests import page_base

pytestmark = pytest.mark.django_db

SECTIONS = {
    "Dashboard": "/",
    "Deployments": "/deployments/",
    "Runs": "/runs/",
    "Compare": "/compare/",
    "Kernels": "/kernels/",
    "Workloads": "/workloads/",
    "Hosts": "/hosts/",
    "SLO": "/slo/",
    "Notes": "/notes/",
    "API": "/tokens/",
}


def _links(html):
    nav = re.search(r"<nav>(.*?)</nav>", html, re.S)[1]
    return re.findall(r'<a href="([^"]*)"( class="active")?>([^<]*)</a>', nav)


def test_the_bar_links_every_section_and_marks_the_page_its_on(client):
    page_base.sign_in(client)

    for label, url in SECTIONS.items():
        links = _links(client.get(url).content.decode())
        assert [(text, href) for href, _, text in links] == list(SECTIONS.items()), label
        assert [text for _, active, text in links if active] == [label]


def test_staff_get_the_admin_link_and_a_script_prefix_prefixes_every_link(client):
    page_base.sign_in(client, "ops", staff=True)
    links = _links(client.get("/runs/").content.decode())
    assert links[-1] == ("/admin/", "", "Admin")

    # as a WSGI server sets it for a site served under /moeops/
    set_script_prefix("/moeops/")
    try:
        links = _links(f"<nav>{nav_links('runs', False)}</nav>")
    finally:
        set_script_prefix("/")
    assert [href for href, _, _ in links] == [f"/moeops{url}" for url in SECTIONS.values()]
    # the links written for one prefix are not those of another
    assert _links(f"<nav>{nav_links('runs', False)}</nav>")[0][0] == "/"
