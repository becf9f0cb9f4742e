"""`make release`: the release artifacts, built by release/release.sh and checked here."""
