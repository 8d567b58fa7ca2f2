# attacks: net.cidr_contains_matches of 256 CIDRs and 128 that all match: the answer's pairs of array indexes [i, j] hash to i + j, so OPA's set probes past all the pairs before it for each new one (32,768 pairs took 29 s), in one call that does not look at the deadline
# expect: deny
package wb.admission

a0 := "10.0.0.0/8,"

a1 := concat("", [a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0])

a2 := concat("", [a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1])

b0 := "10.1.0.0/16,"

b1 := concat("", [b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0])

nets := split(trim_suffix(a2, ","), ",")

subnets := split(trim_suffix(concat("", [b1, b1, b1, b1, b1, b1, b1, b1]), ","), ",")

deny contains "answered in time" if count(net.cidr_contains_matches(nets, subnets)) < 0
