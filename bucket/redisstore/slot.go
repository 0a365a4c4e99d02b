package redisstore

// slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash
// tag, the part between the first '{' and the first '}' after it when
// that part is not empty, else of the whole key, modulo 16384. Operations
// on one Cluster can share a script call only when their keys share it.
func slot(key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					break
				}
			}
			break
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
