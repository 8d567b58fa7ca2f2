# attacks: crypto.x509.parse_rsa_private_key of a key with a 1,048,576-bit modulus: Go's RSA checks take time quadratic in it, inside one call
# expect: deny
package wb.admission

r0 := "////////////////////////////////////////////////////////////////"

r1 := concat("", [r0, r0, r0, r0, r0, r0, r0, r0, r0, r0, r0, r0, r0, r0, r0, r0])

r2 := concat("", [r1, r1, r1, r1, r1, r1, r1, r1, r1, r1, r1, r1, r1, r1, r1, r1])

# 43,690 times "////": the modulus's 0xff bytes.
ones := concat("", [r2, r2, r2, r2, r2, r2, r2, r2, r2, r2, r1, r1, r1, r1, r1, r1, r1, r1, r1, r1, r0, r0, r0, r0, r0, r0, r0, r0, r0, r0, "////////////////////////////////////////"])

pem := concat("", ["-----BEGIN RSA PRIVATE KEY-----\n", "MIMCAB8CAQACgwIAAAD", ones, "/AgMBAAECAQMCAQMCAQMCAQMCAQMCAQM=", "\n-----END RSA PRIVATE KEY-----\n"])

deny contains "never" if crypto.x509.parse_rsa_private_key(pem).kty == "never"
