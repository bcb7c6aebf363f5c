import pytest


def test_healthz(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/", "/embed"])
def test_page_loads_pinned_htmx_from_our_origin(client, path):
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "<title>Decoding Playground</title>" in html
    assert '<script src="/static/vendor/htmx.min.js"' in html
    assert '<script src="/static/vendor/ws.js"' in html
    assert 'href="/static/app.css"' in html
    assert "http://" not in html and "https://" not in html  # everything from our own origin: no CDN


def test_index_has_chrome_and_embed_has_none(client):
    assert "site-header" in client.get("/").text
    assert "site-header" not in client.get("/embed").text


@pytest.mark.parametrize("name", ["htmx.min.js", "ws.js"])
def test_vendor_files_are_served_as_javascript(client, name):
    response = client.get(f"/static/vendor/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/javascript")
    assert "htmx" in response.text


def test_htmx_is_the_pinned_major_version(client):
    assert 'version:"2.' in client.get("/static/vendor/htmx.min.js").text


@pytest.mark.parametrize("name", ["htmx.js", "ws.min.js", "../package.json", "..%2Fpackage.json"])
def test_only_the_two_vendor_files_are_exposed(client, name):
    assert client.get(f"/static/vendor/{name}").status_code == 404


def test_static_css_is_served(client):
    response = client.get("/static/app.css")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/css")


def test_security_headers(client):
    index = client.get("/")
    assert "frame-ancestors 'self'" in index.headers["content-security-policy"]
    assert "default-src 'self'" in index.headers["content-security-policy"]
    assert index.headers["x-content-type-options"] == "nosniff"
    assert "x-frame-options" not in index.headers

    embed = client.get("/embed")
    assert "frame-ancestors *" in embed.headers["content-security-policy"]
    assert "x-frame-options" not in embed.headers

    for path in ["/healthz", "/static/app.css", "/static/vendor/htmx.min.js"]:
        assert client.get(path).headers["x-content-type-options"] == "nosniff"


def test_no_api_docs_that_would_load_a_cdn(client):
    assert client.get("/docs").status_code == 404
