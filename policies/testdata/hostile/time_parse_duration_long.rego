# attacks: time.parse_duration_ns with a duration of 4 MB ("1d" repeated): a duration with days, weeks or years goes through OPA's PEG parser, about 3 µs and 50 bytes a byte (2 MB took 6 s and 100 MiB), in one call that does not look at the deadline
# expect: deny
package wb.admission

s0 := "1d1d1d"

s1 := concat("", [s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0])

s2 := concat("", [s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1])

s3 := concat("", [s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2])

s4 := concat("", [s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3])

duration := concat("", [s4, s4, s4, s4, s4, s4, s4, s4, s4, s4])

deny contains "answered in time" if time.parse_duration_ns(duration) < 0
