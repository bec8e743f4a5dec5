"""Drives the official MiniWoB++ Gymnasium environment (miniwob 1.1.0, Selenium, headless Chromium) for the
fidelity test, and prints one JSON object.

Input (stdin, JSON):
  resets: [{task, seed}]          official reset: utterance, fields, elements
  clicks: [{task, seed, pick}]    `pick` is JavaScript returning the refs to click (run after the reset);
                                  each ref is clicked with the official CLICK_ELEMENT action
  ours:   [{task, seed, utterance, dom}]   our page's core.getDOMInfo() tree and goal: flattened and
                                  field-extracted by the official code, so both sides use one serializer
  idle:   bool                    an idle click-test episode under the package's own time limit

Chromium and chromedriver come from MINIWOB_CHROME_BINARY / MINIWOB_CHROMEDRIVER (the package reads them).
"""

import json
import sys
import time

import gymnasium
import miniwob
from miniwob.action import ActionTypes
from miniwob.dom import DOMElement
from miniwob.fields import get_field_extractor
from miniwob.observation import serialize_dom_element

gymnasium.register_envs(miniwob)


def element_json(e):
    s = serialize_dom_element(e) if isinstance(e, DOMElement) else e
    return {
        "ref": int(s["ref"]),
        "parent": int(s["parent"]),
        "tag": s["tag"],
        "text": s["text"],
        "value": s["value"],
        "id": s["id"],
        "classes": s["classes"],
        "box": [round(float(s[k][0]), 1) for k in ("left", "top", "width", "height")],
    }


def fields_of(task, utterance, raw):
    if isinstance(raw, dict):
        return [[k, v] for k, v in raw["fields"].items()]
    try:
        return [list(f) for f in get_field_extractor(task)(utterance)]
    except KeyError:
        return None


class Envs:
    def __init__(self):
        self.envs = {}

    def get(self, task):
        if task not in self.envs:
            self.envs[task] = gymnasium.make(f"miniwob/{task}-v1")
        return self.envs[task]

    def close(self):
        for env in self.envs.values():
            env.close()


def main():
    req = json.load(sys.stdin)
    out = {"resets": [], "clicks": [], "ours": []}
    envs = Envs()
    idle_env = None
    try:
        if req.get("idle"):
            # Started first, read last: the package's own limit runs while the other cases do.
            idle_env = gymnasium.make("miniwob/click-test-v1")
            idle_env.reset(seed=1)
            idle_start = time.time()
        for case in req.get("resets", []):
            env = envs.get(case["task"])
            obs, info = env.reset(seed=case["seed"])
            driver = env.unwrapped.instance.driver
            out["resets"].append(
                {
                    "task": case["task"],
                    "seed": case["seed"],
                    "utterance": obs["utterance"],
                    "fields": [list(f) for f in obs["fields"]],
                    "elements": [element_json(e) for e in obs["dom_elements"]],
                    "maxTimeMs": driver.execute_script("return core.EPISODE_MAX_TIME;"),
                }
            )
        for case in req.get("clicks", []):
            env = envs.get(case["task"])
            env.reset(seed=case["seed"])
            refs = env.unwrapped.instance.driver.execute_script(case["pick"])
            info = {}
            for ref in refs:
                _, reward, terminated, _, info = env.step(
                    env.unwrapped.create_action(ActionTypes.CLICK_ELEMENT, ref=ref)
                )
            out["clicks"].append(
                {
                    "task": case["task"],
                    "seed": case["seed"],
                    "refs": refs,
                    "done": bool(info.get("done")),
                    "raw": info.get("raw_reward"),
                    "scaled": info.get("env_reward"),
                    "reason": info.get("reason"),
                }
            )
        for case in req.get("ours", []):
            root = DOMElement(case["dom"])
            out["ours"].append(
                {
                    "task": case["task"],
                    "seed": case["seed"],
                    "fields": fields_of(case["task"], case["utterance"], case.get("rawUtterance")),
                    "elements": [element_json(e) for e in root.subtree_elements],
                }
            )
        if idle_env is not None:
            wait = 10.5 - (time.time() - idle_start)
            if wait > 0:
                time.sleep(wait)
            _, reward, terminated, _, info = idle_env.step(None)
            out["idle"] = {
                "maxTimeMs": idle_env.unwrapped.instance.driver.execute_script("return core.EPISODE_MAX_TIME;"),
                "done": bool(info.get("done")),
                "raw": info.get("raw_reward"),
                "reward": reward,
                "reason": info.get("reason"),
            }
    finally:
        envs.close()
        if idle_env is not None:
            idle_env.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
