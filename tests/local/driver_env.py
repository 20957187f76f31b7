"""An environment that drives its own loop, as an ART or verifiers script does: it waits for the
trainer to reach the job's last step, then takes a moment to write its results (a user's script
logging or saving after its last train() call) and exits 0. `grpojob run` must let it finish."""
import json
import os
import sys
import time
import urllib.request

url = os.environ["GRPOJOB_TRAJECTORY_URL"].rstrip("/") + "/status"
token = open(os.environ["GRPOJOB_TOKEN_FILE"]).read().strip()
steps, out = int(sys.argv[1]), sys.argv[2]
while True:
    try:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            if int(json.load(r).get("policy_version") or 0) >= steps:
                break
    except OSError:  # the leader still starting
        pass
    time.sleep(0.2)
time.sleep(1.5)  # the script's tail: its own logging, a results file
with open(out, "w") as f:
    f.write(f"done after step {steps}\n")
