"""An independent check of the S3 presigned URLs of tests/peers/src/cache_stores/s3.rs.

moto does not check query-string signatures, so botocore (the AWS SDK for Python, installed
with moto) signs the same request at the same instant and prints its X-Amz-Signature; the
test compares it with the URL's own.

usage: sigv4_presign_check.py METHOD URL ACCESS_KEY SECRET REGION [NAME:VALUE ...]

URL is the presigned URL: its X-Amz-Date and X-Amz-Expires are reused and its X-Amz-*
parameters dropped before botocore adds its own; NAME:VALUE are the signed headers besides
host (botocore derives host from the URL).
"""

import sys
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def main() -> None:
    method, url, key, secret, region, *headers = sys.argv[1:]
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    auth = {k: v for k, v in query if k.startswith("X-Amz-")}
    kept = [(k, v) for k, v in query if not k.startswith("X-Amz-")]
    base = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), ""))
    request = AWSRequest(
        method=method,
        url=base,
        headers=dict(h.split(":", 1) for h in headers),
    )
    signer = S3SigV4QueryAuth(
        Credentials(key, secret), "s3", region, expires=int(auth["X-Amz-Expires"])
    )
    # add_auth would stamp the current time; the check signs at the URL's own instant.
    request.context["timestamp"] = auth["X-Amz-Date"]
    signer._modify_request_before_signing(request)
    canonical = signer.canonical_request(request)
    print(signer.signature(signer.string_to_sign(request, canonical), request))


if __name__ == "__main__":
    main()
