#!/usr/bin/env bash
# Build the documentation site (mkdocs.yml) into site/, warnings as errors: a broken link or
# anchor, a page missing from the navigation, a name the API reference cannot render fails it.
# `mkdocs serve` (in .venv) shows it while you edit.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/mkdocs ] || .venv/bin/python -m pip install -q -e ".[docs]" 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
# NO_MKDOCS_2_WARNING: Material's note about its own future, not about these docs
NO_MKDOCS_2_WARNING=1 TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/mkdocs build --strict -q -d site
# the site opens as files: a link to a folder would open a directory listing, and search
# needs its index as a script (the offline plugin's search/search_index.js)
folders=$(grep -rhoE 'href="[^"#:]*/"' site --include=*.html | sort -u | head -5 || true)
if [ -n "$folders" ] || [ ! -f site/search/search_index.js ]; then
  echo "build_docs.sh: the site does not open as files: links to folders (${folders:-none})" \
       "or no site/search/search_index.js" >&2
  exit 1
fi
echo "build_docs.sh: the site is in site/ (open site/index.html)"
