# attacks: io.jwt.verify_es256 against a key set of 32,768 P-256 keys (4 MiB) and a token with no kid: every key is parsed and tried in turn inside one call (0.66 s, 100 MiB), while the key bound counted only the squares of each key's short runs (a run now counts for at least 64 bytes)
# expect: deny
package wb.admission

k0 := `{"kty":"EC","crv":"P-256","x":"w0-53WecTv_Ue0NFxoC4ZIZXF2PFEMXwcckW6c5wHeI","y":"Es8xcQyAIM8cKHTajYSV3KsZ3xYg0IZ6blwCF17YVZA"}`

k1 := concat(",", [k0, k0, k0, k0, k0, k0, k0, k0, k0, k0, k0, k0, k0, k0, k0, k0])

k2 := concat(",", [k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1])

k3 := concat(",", [k2, k2, k2, k2, k2, k2, k2, k2, k2, k2, k2, k2, k2, k2, k2, k2])

k4 := concat(",", [k3, k3, k3, k3, k3, k3, k3, k3])

jwks := concat("", [`{"keys":[`, k4, `]}`])

token := "eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ4In0.AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4_QA"

deny contains "answered in time" if not io.jwt.verify_es256(token, jwks)
