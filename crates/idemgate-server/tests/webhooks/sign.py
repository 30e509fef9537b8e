"""Signs webhook deliveries as each provider does, for the e2e tests.

Reads a JSON list of deliveries on stdin, each
  {"provider": "stripe" | "github" | "shopify" | "standard",
   "secret": str, "payload": str, "timestamp": int, "id": str}
and writes a JSON list of the headers each delivery carries (its signature
headers; the id headers are the test's).

Stripe and Standard Webhooks are signed by their own libraries (the `stripe`
package's WebhookSignature.generate_signature_header, the `standardwebhooks`
package's Webhook.sign), pinned in requirements.txt beside this file. GitHub
and Shopify publish no signing library: they are signed as their
documentation's reference code does (Python's hmac, hashlib and base64), and
GitHub's documented test vector is checked first, so a signer that drifted
fails here before any test trusts it.
"""

import base64
import hashlib
import hmac
import json
import sys
from datetime import datetime, timezone

import stripe
from standardwebhooks.webhooks import Webhook as StandardWebhook

# https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
GITHUB_VECTOR = (
    "It's a Secret to Everybody",
    "Hello, World!",
    "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
)


def github(secret: str, payload: str) -> str:
    digest = hmac.new(secret.encode(), payload.encode(), hashlib.sha256).hexdigest()
    return "sha256=" + digest


def shopify(secret: str, payload: str) -> str:
    digest = hmac.new(secret.encode(), payload.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def sign(delivery: dict) -> dict:
    provider = delivery["provider"]
    secret = delivery["secret"]
    payload = delivery["payload"]
    if provider == "stripe":
        header = stripe.WebhookSignature.generate_signature_header(
            payload, secret, timestamp=delivery["timestamp"]
        )
        return {"Stripe-Signature": header}
    if provider == "github":
        return {"X-Hub-Signature-256": github(secret, payload)}
    if provider == "shopify":
        return {"X-Shopify-Hmac-Sha256": shopify(secret, payload)}
    if provider == "standard":
        at = datetime.fromtimestamp(delivery["timestamp"], tz=timezone.utc)
        signature = StandardWebhook(secret).sign(delivery["id"], at, payload)
        return {
            "webhook-id": delivery["id"],
            "webhook-timestamp": str(delivery["timestamp"]),
            "webhook-signature": signature,
        }
    raise SystemExit(f"sign.py: unknown provider {provider!r}")


def main() -> None:
    secret, payload, expected = GITHUB_VECTOR
    if github(secret, payload) != expected:
        raise SystemExit("sign.py: GitHub's documented test vector does not reproduce")
    deliveries = json.load(sys.stdin)
    json.dump([sign(delivery) for delivery in deliveries], sys.stdout)


if __name__ == "__main__":
    main()
