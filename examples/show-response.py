"""Print an AdmissionReview answer readably: allowed, warnings, and the decoded JSON Patch.

curl ... https://127.0.0.1:8443/mutate | python3 examples/show-response.py
"""

import base64
import json
import sys

response = json.load(sys.stdin)["response"]
print(f"allowed: {json.dumps(response['allowed'])}")
for warning in response.get("warnings", []):
    print(f"warning: {warning}")
if "patch" in response:
    print("patch:")
    for operation in json.loads(base64.b64decode(response["patch"])):
        print(f"  {json.dumps(operation)}")
