# attacks: regex.match with a 3 KiB pattern repeated a thousand times on an empty text: the pattern compiles to 3 million instructions, seconds and a gigabyte of allocation inside one call (and OPA keeps the compiled pattern in its cache)
# expect: deny
package wb.admission

a0 := "aaaaaaaaaaaaaaaa"

a1 := concat("", [a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0])

a2 := concat("", [a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1])

pattern := concat("", ["(?:", a2, "){1000}"])

deny contains "answered in time" if not regex.match(pattern, "")
