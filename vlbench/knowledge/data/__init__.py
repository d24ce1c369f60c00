"""Knowledge data: resources (URLs, sha256), vocabulary bindings and alias tables, read by vlbench/knowledge/sources.py."""
