"""The e2e suite's harness: the real components it starts and the helpers its tests share.

No test lives here; the tests are in the sibling folders, grouped by what they need.
"""
