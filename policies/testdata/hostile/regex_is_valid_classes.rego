# attacks: regex.is_valid of a pattern of 262,144 \pL classes (768 KiB): Go's parser expands each class to its 1,300 ranges, a second and 190 MiB inside one call (until Go's parser gives up at 32 million runes)
# expect: deny
package wb.admission

a0 := `\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL`

a1 := concat("", [a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0])

a2 := concat("", [a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1])

a3 := concat("", [a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2])

pattern := concat("", [a3, a3, a3, a3])

deny contains "answered in time" if regex.is_valid(pattern)
