# attacks: net.cidr_contains_matches of 7 CIDRs keyed by [512 KiB of "x", i] (equal texts, each its own copy) and 190 addresses: the answer's pairs hash near each other, and each probe of OPA's set compares the new pair's 512 KiB key with the one in the slot (884,000 probes took 6 s), in one call that does not look at the deadline
# expect: deny
package wb.admission

x0 := "xxxxxxxxxxxxxxxx"

x1 := concat("", [x0, x0, x0, x0, x0, x0, x0, x0, x0, x0, x0, x0, x0, x0, x0, x0])

x2 := concat("", [x1, x1, x1, x1, x1, x1, x1, x1, x1, x1, x1, x1, x1, x1, x1, x1])

x3 := concat("", [x2, x2, x2, x2, x2, x2, x2, x2, x2, x2, x2, x2, x2, x2, x2, x2])

pad := concat("", [x3, x3, x3, x3, x3, x3, x3, x3])

nets := {[concat("", [pad, ""]), i]: "10.0.0.0/8" | some i in numbers.range(0, 6)}

addresses := [sprintf("10.1.0.%d", [j]) | some j in numbers.range(0, 189)]

deny contains "answered in time" if count(net.cidr_contains_matches(nets, addresses)) < 0
